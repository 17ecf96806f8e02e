"""Served mode: ``serve`` (the supervisor) and the ``node`` group (serve, kill, slow, stop,
start)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tectonic_emu.cli.common import (
    buffers_option,
    cluster_option,
    json_option,
    print_json,
    qos_mode_option,
    run,
    with_cluster,
)
from tectonic_emu.cluster import Cluster
from tectonic_emu.config import (
    parse_duration,
    parse_size,
)
from tectonic_emu.errors import InvalidArgumentError


# -- serving ---------------------------------------------------------------------------------
def _parse_slow(values: tuple[str, ...]) -> dict[int, float]:
    slow: dict[int, float] = {}
    for v in values:
        node, sep, delay = v.partition("=")
        if not sep or not node.strip().isdigit():
            raise click.BadParameter(f"--slow takes NODE=DELAY (e.g. 3=50ms), not {v!r}")
        slow[int(node)] = parse_duration(delay)
    return slow


def _setup_logging() -> None:
    import logging

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )


@click.command("serve")
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
    "--gc-grace",
    default="600s",
    show_default=True,
    help="Garbage collection's margin after a writer's lease runs out before it is fenced, "
    "and the least age of an unclaimed chunk it deletes. Not negative.",
)
@click.option(
    "--backup-interval",
    default=None,
    help="Pause between metadata backups onto the nodes (0: off) [default: the cluster's].",
)
@click.option(
    "--background",
    is_flag=True,
    help="Return once every node is live; the log goes to DIR/serve.log.",
)
@click.option("--stop", is_flag=True, help="Stop the cluster's serve (and its nodes) and return.")
@qos_mode_option
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve each node's figures to Prometheus at http://HOST:PORT+N/metrics (node N).",
)
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
    backup_interval: str | None,
    background: bool,
    stop: bool,
    qos: str | None,
    metrics_port: int | None,
) -> None:
    """Serve the cluster: one process per storage node on TCP, plus repair and scrub.

    Runs until Ctrl-C or SIGTERM (or `serve --stop`), then stops every node cleanly. While
    it runs, every other command (from any number of processes) reaches the nodes over TCP.

    \b
    Example:
      tectonic-emu serve --cluster /tmp/c1 --repair-after 60s --background
      tectonic-emu serve --cluster /tmp/c1 --qos fifo --metrics-port 9100 --background
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
        backup_interval=None if backup_interval is None else parse_duration(backup_interval),
        qos=qos,
        metrics_port=metrics_port,
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
        if backup_interval is not None:
            raw["backup_interval"] = backup_interval
        if qos is not None:
            raw["qos"] = qos
        if metrics_port is not None:
            raw["metrics_port"] = metrics_port
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
@click.group("node")
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
@click.option(
    "--secret",
    "secret_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The cluster secret file (mode 0600) [default: DIR/secret].",
)
@buffers_option
@qos_mode_option
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the node's figures to Prometheus at http://HOST:PORT/metrics.",
)
def node_serve(
    cluster_dir: Path,
    node: int,
    host: str | None,
    port: int | None,
    slow: str,
    secret_file: Path | None,
    buffers: int,
    qos: str | None,
    metrics_port: int | None,
) -> None:
    """Serve one storage node in this process (`serve` starts these for every node).

    Its chunks go in DIR/nodes/nNNN on this host. A cluster created with --node-addresses
    names where each node listens: run this on that host, and clients anywhere reach it.
    Otherwise it writes DIR/nodes/nNNN/address.json so that clients sharing DIR find it.
    Every client must prove it knows the cluster secret (DIR/secret, or a copy of it given
    with --secret on a host that does not share DIR). Runs until SIGTERM or Ctrl-C.

    \b
    Example:
      tectonic-emu node serve --cluster /srv/c1 --node 4      # at its address in cluster.json
      tectonic-emu node serve --cluster /shared/c1 --node 4 --host 0.0.0.0 --port 7004
      tectonic-emu node serve --cluster /srv/c1 --node 4 --secret /etc/tectonic/c1.secret
    """
    from tectonic_emu.served import run_node

    _setup_logging()
    run(
        run_node(
            cluster_dir,
            node,
            host=host,
            port=port,
            delay=parse_duration(slow),
            buffers=buffers,
            secret_file=secret_file,
            qos=qos,
            metrics_port=metrics_port,
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
        if not c.served:  # an embedded node's delay would end with this command's process
            raise InvalidArgumentError(
                "only a served node can be slowed from the command line (run `tectonic-emu "
                "serve` first)"
            )
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


__all__ = ["node_group", "serve_cmd"]
