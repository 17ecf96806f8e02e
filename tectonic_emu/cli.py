"""The ``tectonic-emu`` command.

Every command takes ``--cluster DIR`` (default ``$TECTONIC_EMU_CLUSTER``). Errors print one
line on stderr and exit non-zero; nothing stored changes. Packages above the core (bench,
fuse_mount, clients) add command groups through the ``tectonic_emu.commands`` entry point.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from tectonic_emu.cluster import Cluster
from tectonic_emu.coding import KNOWN_ENCODINGS, Encoding
from tectonic_emu.config import (
    DEFAULT_BLOCK_SIZE,
    parse_duration,
    parse_node_addresses,
    parse_size,
    redact,
)
from tectonic_emu.demo import DemoReport, run_demo
from tectonic_emu.errors import IsADirectoryError_, NotFoundError, TectonicError
from tectonic_emu.paths import join_path, split_path
from tectonic_emu.resources import Needs, check_fits, human_bytes
from tectonic_emu.services import DEFAULT_GC_GRACE, repair, scrub

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True)
out_console = Console()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def cluster_option(fn: F) -> F:
    return click.option(
        "--cluster",
        "cluster_dir",
        envvar="TECTONIC_EMU_CLUSTER",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Cluster directory (default: $TECTONIC_EMU_CLUSTER).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def progress_bar(total: int | None) -> Progress:
    """A transfer bar on stderr, shown only when stderr is a terminal: percentage, bytes,
    rate and ETA once a task has a total; a pulsing bar until then."""
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=not err_console.is_terminal,
        transient=True,
    )


async def with_cluster(path: Path, fn: Callable[[Cluster], Awaitable[T]]) -> T:
    async with Cluster.open(path) as cluster:
        return await fn(cluster)


class LazyGroup(click.Group):
    """The root group: also lists the command groups other packages register."""

    def _plugins(self) -> dict[str, click.Command]:
        found: dict[str, click.Command] = {}
        for ep in entry_points(group="tectonic_emu.commands"):
            try:
                cmd = ep.load()
            except ImportError:
                continue  # an optional extra that is not installed
            if isinstance(cmd, click.Command):
                found[ep.name] = cmd
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugins()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or self._plugins().get(name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tectonic-emu")
def cli() -> None:
    """tectonic-emu: a Tectonic-style store for studying AI-training storage.

    \b
    Example:
      export TECTONIC_EMU_CLUSTER=/tmp/c1
      tectonic-emu cluster create --nodes 9 --encoding rs-6-3
      tectonic-emu put model.bin /ckpt/model.bin
      tectonic-emu cluster status --json
    """


# -- cluster ---------------------------------------------------------------------------------
@cli.group("cluster")
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
    "--metadata-table",
    default="tectonic_kv",
    show_default=True,
    help="The table in that database (one per cluster; it must be empty or missing).",
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
    metadata_table: str,
    as_json: bool,
) -> None:
    """Create a new cluster in DIR.

    \b
    Example:
      tectonic-emu cluster create --cluster /tmp/c1 --nodes 12 --disks-per-node 2 --encoding r3
      tectonic-emu cluster create --cluster /tmp/c2 --metadata postgresql://tectonic@db1/tectonic
      tectonic-emu cluster create --cluster /tmp/c3 --nic-gbps 10 --rtt-ms 0.5 --loss 0.0001
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


# -- files -----------------------------------------------------------------------------------
@cli.command("put")
@cluster_option
@click.argument("local", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.argument("remote")
@click.option("--encoding", default=None, help="r1, r3 or rs-D-P (default: inherited).")
def put(cluster_dir: Path, local: str, remote: str, encoding: str | None) -> None:
    """Copy a local file (or - for stdin) into the cluster, replacing REMOTE atomically.

    \b
    Example:
      tectonic-emu put --cluster /tmp/c1 ./shard-0001.parquet /data/shard-0001.parquet
    """

    # The temporary file is a sibling with a short name of its own: REMOTE's name plus a
    # suffix could pass the 255-byte limit that REMOTE itself meets.
    parts = split_path(remote)
    tmp = join_path([*parts[:-1], f".put-{os.getpid()}.tmp"])
    src = sys.stdin.buffer if local == "-" else open(local, "rb")  # noqa: SIM115
    total = None if local == "-" else os.fstat(src.fileno()).st_size

    async def go(c: Cluster) -> None:
        client = c.client()
        if await client.exists(remote) and (await client.stat(remote)).kind == "dir":
            raise IsADirectoryError_("is a directory", remote)
        chunk = c.config.block_size * 4
        try:
            with progress_bar(total) as bar:
                task = bar.add_task(f"put {remote}", total=total)
                async with client.open_writer(tmp, encoding=encoding) as w:
                    while data := await asyncio.to_thread(src.read, chunk):
                        await w.append(data)
                        bar.advance(task, len(data))
            await client.rename(tmp, remote)
        except BaseException:
            if await client.exists(tmp):
                await client.delete(tmp)
            raise
        finally:
            if src is not sys.stdin.buffer:
                src.close()

    run(with_cluster(cluster_dir, go))


@cli.command("get")
@cluster_option
@click.argument("remote")
@click.argument("local", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
def get(cluster_dir: Path, remote: str, local: str) -> None:
    """Copy REMOTE out of the cluster to a local file (or - for stdout).

    \b
    Example:
      tectonic-emu get --cluster /tmp/c1 /ckpt/step-100/rank-0 ./rank-0.bin
    """

    if local != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(local))):
        raise NotFoundError("no such local directory", os.path.dirname(os.path.abspath(local)))

    async def go(c: Cluster) -> None:
        client = c.client()
        st = await client.stat(remote)
        if st.kind == "dir":
            raise IsADirectoryError_("is a directory", remote)
        piece = c.config.block_size * 4
        buf = bytearray(min(piece, max(st.size, 1)))
        dst = (
            sys.stdout.buffer
            if local == "-"
            else await asyncio.to_thread(open, local + ".part", "wb")
        )
        try:
            with progress_bar(st.size) as bar:
                task = bar.add_task(f"get {remote}", total=st.size)
                off = 0
                while off < st.size:
                    n = await client.read_into(remote, off, buf)
                    if n == 0:
                        break
                    await asyncio.to_thread(dst.write, memoryview(buf)[:n])
                    off += n
                    bar.advance(task, n)
            dst.flush()
        except BaseException:
            if dst is not sys.stdout.buffer:
                dst.close()
                os.unlink(local + ".part")
            raise
        if dst is not sys.stdout.buffer:
            dst.close()
            os.replace(local + ".part", local)

    run(with_cluster(cluster_dir, go))


@cli.command("ls")
@cluster_option
@click.argument("path", default="/")
@click.option("-l", "long", is_flag=True, help="Long listing: kind, size, encoding, sealed.")
@json_option
def ls(cluster_dir: Path, path: str, long: bool, as_json: bool) -> None:
    """List a directory.

    \b
    Example:
      tectonic-emu ls --cluster /tmp/c1 -l /ckpt
    """

    async def go(c: Cluster) -> list[dict[str, Any]]:
        client = c.client()
        st = await client.stat(path)
        if st.kind == "file":
            return [_stat_dict(st)]
        out = []
        for e in await client.scandir(path):
            sub = await client.stat(path.rstrip("/") + "/" + e.name)
            out.append(_stat_dict(sub))
        return out

    rows = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(rows)
        return
    for r in rows:
        name = r["path"].rsplit("/", 1)[-1] + ("/" if r["kind"] == "dir" else "")
        if long:
            click.echo(
                f"{r['kind']:4} {r['size']:>14} {r['encoding'] or '-':8} "
                f"{'sealed' if r['sealed'] else ('-' if r['kind'] == 'dir' else 'open'):6} {name}"
            )
        else:
            click.echo(name)


def _stat_dict(st: Any) -> dict[str, Any]:
    return {
        "path": st.path,
        "kind": st.kind,
        "size": st.size,
        "encoding": st.encoding,
        "sealed": st.sealed,
        "blocks": st.nblocks,
        "ctime": st.ctime,
        "mtime": st.mtime,
    }


@cli.command("mkdir")
@cluster_option
@click.argument("path")
@click.option(
    "-p", "--parents", is_flag=True, help="Make parents as needed; no error if it exists."
)
@click.option("--encoding", default=None, help="Encoding files below inherit.")
def mkdir(cluster_dir: Path, path: str, parents: bool, encoding: str | None) -> None:
    """Make a directory.

    \b
    Example:
      tectonic-emu mkdir --cluster /tmp/c1 -p /ckpt/llama --encoding rs-9-6
    """
    run(
        with_cluster(
            cluster_dir, lambda c: c.client().mkdir(path, parents=parents, encoding=encoding)
        )
    )


@cli.command("mv")
@cluster_option
@click.argument("src")
@click.argument("dst")
def mv(cluster_dir: Path, src: str, dst: str) -> None:
    """Rename atomically (replacing a file at DST).

    \b
    Example:
      tectonic-emu mv --cluster /tmp/c1 /ckpt/step-10.tmp /ckpt/step-10
    """
    run(with_cluster(cluster_dir, lambda c: c.client().rename(src, dst)))


@cli.command("rm")
@cluster_option
@click.argument("path")
@click.option("-r", "--recursive", is_flag=True, help="Remove a directory and everything below.")
def rm(cluster_dir: Path, path: str, recursive: bool) -> None:
    """Remove a file or an empty directory (-r: any directory).

    \b
    Example:
      tectonic-emu rm --cluster /tmp/c1 -r /ckpt/step-10
    """
    run(with_cluster(cluster_dir, lambda c: c.client().delete(path, recursive=recursive)))


@cli.command("stat")
@cluster_option
@click.argument("path")
@json_option
def stat(cluster_dir: Path, path: str, as_json: bool) -> None:
    """Size, encoding, sealed, and (files) every block's chunks with node, disk and file path.

    \b
    Example:
      tectonic-emu stat --cluster /tmp/c1 /ckpt/step-10/rank-0 --json
    """

    async def go(c: Cluster) -> dict[str, Any]:
        client = c.client()
        st = await client.stat(path)
        d = _stat_dict(st)
        if st.kind == "file":
            d["block_list"] = [
                {
                    "block_no": b.block_no,
                    "block_id": f"{b.block_id:016x}",
                    "offset": b.offset,
                    "length": b.length,
                    "chunks": [
                        {
                            "index": ch.index,
                            "node": ch.node,
                            "disk": ch.disk,
                            "chunk_id": ch.chunk_id,
                            "crc32c": ch.crc32c,
                            "stored_len": ch.stored_len,
                            "compressed": bool(ch.flags & 1),
                            "path": p,
                        }
                        for ch, p in zip(b.chunks, b.chunk_paths, strict=True)
                    ],
                }
                for b in await client.layout(path)
            ]
        return d

    d = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(d)
        return
    for k in ("path", "kind", "size", "encoding", "sealed", "blocks"):
        click.echo(f"{k:9} {d[k]}")
    for b in d.get("block_list", []):
        nodes = ",".join(f"n{c['node']}/d{c['disk']}" for c in b["chunks"])
        click.echo(f"  block {b['block_no']} @{b['offset']} +{b['length']}: {nodes}")


# -- serving ---------------------------------------------------------------------------------
def _parse_slow(values: tuple[str, ...]) -> dict[int, float]:
    slow: dict[int, float] = {}
    for v in values:
        node, sep, delay = v.partition("=")
        if not sep or not node.strip().isdigit():
            raise click.BadParameter(f"--slow takes NODE=DELAY (e.g. 3=50ms), not {v!r}")
        slow[int(node)] = parse_duration(delay)
    return slow


buffers_option = click.option(
    "--buffers",
    default=8,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Chunk buffers each node process keeps in memory.",
)


def _setup_logging() -> None:
    import logging

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )


@cli.command("serve")
@cluster_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address nodes bind to (a cluster made with --node-addresses: each node's own).",
)
@click.option(
    "--slow", multiple=True, metavar="NODE=DELAY", help="Delay one node's replies (repeatable)."
)
@buffers_option
@click.option(
    "--repair-interval", default="10s", show_default=True, help="Pause between repair passes."
)
@click.option(
    "--repair-after",
    default="30s",
    show_default=True,
    help="Rebuild a down node's chunks once it has been down this long.",
)
@click.option(
    "--scrub-interval", default="0", show_default=True, help="Pause between scrubs (0: off)."
)
@click.option("--scrub-rate", default="50MiB", show_default=True, help="Scrub read rate per s.")
@click.option(
    "--gc-grace", default="600s", show_default=True, help="Age before garbage is collected."
)
@click.option(
    "--background",
    is_flag=True,
    help="Return once every node is live; the log goes to DIR/serve.log.",
)
@click.option("--stop", is_flag=True, help="Stop the cluster's serve (and its nodes) and return.")
def serve_cmd(
    cluster_dir: Path,
    host: str,
    slow: tuple[str, ...],
    buffers: int,
    repair_interval: str,
    repair_after: str,
    scrub_interval: str,
    scrub_rate: str,
    gc_grace: str,
    background: bool,
    stop: bool,
) -> None:
    """Serve the cluster: one process per storage node on TCP, plus repair and scrub.

    Runs until Ctrl-C or SIGTERM (or `serve --stop`), then stops every node cleanly. While
    it runs, every other command (from any number of processes) reaches the nodes over TCP.

    \b
    Example:
      tectonic-emu serve --cluster /tmp/c1 --repair-after 60s --background
      tectonic-emu cluster status --cluster /tmp/c1
      tectonic-emu node kill --cluster /tmp/c1 3
      tectonic-emu serve --cluster /tmp/c1 --stop
    """
    from tectonic_emu.served import ServeOptions, Serving, run_supervisor, stop_supervisor

    if stop:
        pid = stop_supervisor(cluster_dir)
        click.echo(f"stopped serve (pid {pid})" if pid else f"nothing serves {cluster_dir}")
        return
    options = ServeOptions(
        host=host,
        slow=_parse_slow(slow),
        buffers=buffers,
        repair_interval=parse_duration(repair_interval),
        repair_after=parse_duration(repair_after),
        scrub_interval=parse_duration(scrub_interval),
        scrub_rate=float(parse_size(scrub_rate)),
        gc_grace=parse_duration(gc_grace),
    )
    if background:
        log = cluster_dir / "serve.log"
        raw: dict[str, Any] = {
            "host": host,
            "slow": dict(v.split("=", 1) for v in slow),
            "buffers": buffers,
        }
        raw |= {"repair_interval": repair_interval, "repair_after": repair_after}
        raw |= {"scrub_interval": scrub_interval, "scrub_rate": scrub_rate, "gc_grace": gc_grace}
        serving = Serving(cluster_dir, log=log, detach=True, **raw).start()
        assert serving.proc is not None
        click.echo(
            f"serving {cluster_dir} (pid {serving.proc.pid}, log {log}); "
            f"stop with: tectonic-emu serve --stop"
        )
        return
    _setup_logging()
    run(run_supervisor(cluster_dir, options))


# -- nodes and services ----------------------------------------------------------------------
@cli.group("node")
def node_group() -> None:
    """Run storage nodes, and take them out of service and back (fault injection).

    \b
    Example:
      tectonic-emu node stop --cluster /tmp/c1 3
      tectonic-emu node kill --cluster /tmp/c1 3     # served clusters: SIGKILL
    """


@node_group.command("serve")
@cluster_option
@click.option("--node", "node", type=int, required=True, help="Which node to serve.")
@click.option(
    "--host",
    default=None,
    help="Address to bind [default: the node's address in cluster.json, else 127.0.0.1].",
)
@click.option(
    "--port",
    default=None,
    type=int,
    help="Port [default: the node's port in cluster.json, else 0: any free one].",
)
@click.option("--slow", default="0", show_default=True, help="Delay added to every reply.")
@buffers_option
def node_serve(
    cluster_dir: Path, node: int, host: str | None, port: int | None, slow: str, buffers: int
) -> None:
    """Serve one storage node in this process (`serve` starts these for every node).

    Its chunks go in DIR/nodes/nNNN on this host. A cluster created with --node-addresses
    names where each node listens: run this on that host, and clients anywhere reach it.
    Otherwise it writes DIR/nodes/nNNN/address.json so that clients sharing DIR find it.
    Runs until SIGTERM or Ctrl-C.

    \b
    Example:
      tectonic-emu node serve --cluster /srv/c1 --node 4      # at its address in cluster.json
      tectonic-emu node serve --cluster /shared/c1 --node 4 --host 0.0.0.0 --port 7004
    """
    from tectonic_emu.served import run_node

    _setup_logging()
    run(
        run_node(
            cluster_dir, node, host=host, port=port, delay=parse_duration(slow), buffers=buffers
        )
    )


@node_group.command("kill")
@cluster_option
@click.argument("node", type=int)
@json_option
def node_kill(cluster_dir: Path, node: int, as_json: bool) -> None:
    """SIGKILL node N's process (served clusters): it stays down until `node start`.

    \b
    Example:
      tectonic-emu node kill --cluster /tmp/c1 3
    """

    async def go(c: Cluster) -> int:
        return c.kill_node(node)

    pid = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json({"node": node, "pid": pid, "signal": "SIGKILL"})
    else:
        click.echo(f"node {node}: killed pid {pid}")


# A negative delay reaches parse_duration, which says so, instead of click's "No such option".
@node_group.command("slow", context_settings={"ignore_unknown_options": True})
@cluster_option
@click.argument("node", type=int)
@click.argument("delay")
def node_slow(cluster_dir: Path, node: int, delay: str) -> None:
    """Make served node N add DELAY to every reply but heartbeats (0 to undo).

    \b
    Example:
      tectonic-emu node slow --cluster /tmp/c1 3 100ms
    """
    seconds = parse_duration(delay)

    async def go(c: Cluster) -> None:
        await c.set_node_delay(node, seconds)

    run(with_cluster(cluster_dir, go))


async def _set_node(path: Path, n: int, up: bool) -> None:
    async with Cluster.open(path) as c:
        (c.start_node if up else c.stop_node)(n)


@node_group.command("stop")
@cluster_option
@click.argument("node", type=int)
def node_stop(cluster_dir: Path, node: int) -> None:
    """Stop node N: it answers nothing until started again.

    \b
    Example:
      tectonic-emu node stop --cluster /tmp/c1 3
    """
    run(_set_node(cluster_dir, node, False))


@node_group.command("start")
@cluster_option
@click.argument("node", type=int)
def node_start(cluster_dir: Path, node: int) -> None:
    """Start node N again.

    \b
    Example:
      tectonic-emu node start --cluster /tmp/c1 3
    """
    run(_set_node(cluster_dir, node, True))


@cli.command("scrub")
@cluster_option
@json_option
def scrub_cmd(cluster_dir: Path, as_json: bool) -> None:
    """Read and verify every chunk; list corrupt, missing and unreachable ones.

    Exits 0 when everything is clean, 3 when problems were found.

    \b
    Example:
      tectonic-emu scrub --cluster /tmp/c1 --json
    """

    async def go(c: Cluster) -> Any:
        total = (await c.status()).physical_bytes  # scrub counts the chunk bytes it checked
        with progress_bar(total) as bar:
            task = bar.add_task("scrub", total=total)
            return await scrub(c, progress=lambda n: bar.advance(task, n))

    report = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(
            f"checked {report.blocks} blocks, {report.chunks} chunks, "
            f"{human_bytes(report.bytes_checked)}: "
            f"{len(report.corrupt)} corrupt, {len(report.missing)} missing, "
            f"{len(report.unavailable)} on nodes that are down"
        )
        for kind, items in (("corrupt", report.corrupt), ("missing", report.missing)):
            for p in items:
                click.echo(f"  {kind}: block {p.block_id} chunk {p.index} node {p.node}: {p.path}")
    if not report.clean:
        sys.exit(3)


@cli.command("repair")
@cluster_option
@click.option(
    "--gc-grace",
    default=DEFAULT_GC_GRACE,
    show_default=True,
    help="Delete unreferenced chunks only when older than this many seconds.",
)
@json_option
def repair_cmd(cluster_dir: Path, gc_grace: float, as_json: bool) -> None:
    """Rebuild missing or corrupt chunks until every block has full redundancy.

    \b
    Example:
      tectonic-emu repair --cluster /tmp/c1 --json
    """

    async def go(c: Cluster) -> Any:
        total = (await c.status()).logical_bytes  # repair counts each block's length
        with progress_bar(total) as bar:
            task = bar.add_task("repair", total=total)
            return await repair(c, gc_grace=gc_grace, progress=lambda n: bar.advance(task, n))

    report = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(
            f"checked {report.blocks_checked} blocks: repaired {report.blocks_repaired} "
            f"({report.chunks_rebuilt} chunks rebuilt), {len(report.unrecoverable)} unrecoverable, "
            f"{len(report.not_enough_nodes)} waiting for nodes; "
            f"{report.garbage_chunks_deleted} garbage chunks deleted"
        )
    if report.unrecoverable or report.not_enough_nodes:
        sys.exit(3)


@cli.command("demo")
@click.option(
    "--cluster",
    "cluster_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to create the demo cluster (default: a temporary directory, removed after).",
)
@click.option(
    "--size", default="48MiB", show_default=True, help="Bytes written per encoding (at least 1MiB)."
)
@json_option
def demo(cluster_dir: Path | None, size: str, as_json: bool) -> None:
    """The main job: store and read back data with every encoding, lose a node, repair.

    Exits 0 only if every byte read back was right and repair restored full redundancy.

    \b
    Example:
      tectonic-emu demo --size 64MiB
    """
    nbytes = parse_size(size)
    where = cluster_dir if cluster_dir is not None else Path(tempfile.gettempdir())
    overheads = sum(Encoding.parse(e).overhead for e in KNOWN_ENCODINGS)
    check_fits(
        nbytes,
        # The bytes written, their read-back copy and the blocks in flight; every encoding's
        # file on disk at once.
        lambda n: Needs(memory=3 * n, disk=math.ceil(n * overheads)),
        where,
        minimum=DEMO_MIN_SIZE,
        at_least="less takes too little time to give a rate",
    )
    with err_console.status("demo") as status:
        report = run(run_demo(cluster_dir, size=nbytes, step=lambda s: status.update(s)))
    if as_json:
        print_json(report.to_dict())
    else:
        _print_demo(report, nbytes)
    if not report.all_verified or report.below_redundancy_after_restart:
        sys.exit(3)


DEMO_MIN_SIZE = 1 << 20  # below a MiB a write or read takes too little time to give a rate


def _print_demo(report: DemoReport, nbytes: int) -> None:
    lost = f"node {report.stopped_node} lost"
    table = Table(title=f"tectonic-emu demo: {report.nodes} nodes, {human_bytes(nbytes)} each")
    for col in ("encoding", "overhead", "write MB/s", "read MB/s", "read back", lost):
        table.add_column(col, justify="right")
    for r in report.results:
        table.add_row(
            r.encoding,
            f"{r.overhead:.2f}x",
            f"{r.write_mb_s:.0f}",
            f"{r.read_mb_s:.0f}",
            _ok(r.verified),
            _ok(r.verified_after_node_loss),
        )
    out_console.print(table)
    held = report.stopped_node_encodings
    missing = [e for e in KNOWN_ENCODINGS if e not in held and e != "r1"]
    if missing:
        which = f"held no chunks of {', '.join(missing)} (too few blocks to reach every node)"
    else:
        which = "held chunks of every encoding but r1 (one copy survives no loss)"
    out_console.print(f"node {report.stopped_node} {which}")
    out_console.print(
        f"blocks below redundancy: {report.below_redundancy_after_loss} after the loss, "
        f"{report.below_redundancy_after_repair} after repair"
    )
    if report.below_redundancy_after_repair:
        out_console.print("  (encodings as wide as the cluster wait for the node to return)")
    out_console.print(
        f"repair rebuilt {report.repaired_blocks} blocks; "
        f"{report.below_redundancy_after_restart} below redundancy once the node was back"
    )


def _ok(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]NO[/red]"


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line on stderr for every expected error, no traceback."""
    try:
        code = cli.main(args=argv, prog_name="tectonic-emu", standalone_mode=False)
    except click.UsageError as e:
        # One line, as for every other error: click's own three (usage, hint, error) bury it.
        where = e.ctx.command_path if e.ctx is not None else "tectonic-emu"
        what = e.format_message()
        if isinstance(e, click.NoSuchOption) and e.option_name[1:2].isdigit():
            what = f"{e.option_name} is not an option, and this command takes no negative number"
        click.echo(f"{where}: error: {what} (see {where} --help)", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"tectonic-emu: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except (TectonicError, OSError) as e:
        click.echo(f"tectonic-emu: error: {_describe(e)}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _describe(e: OSError) -> str:
    if isinstance(e, TectonicError):
        return str(e)
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror or e}{where}"


__all__ = ["cli", "main", "parse_duration"]
