"""``meta``: dump, load, back up and restore the cluster's metadata (docs/metadata.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, BinaryIO

import click

from tectonic_emu.cli.common import cluster_option, json_option, print_json, run
from tectonic_emu.cluster import Cluster
from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import InvalidArgumentError, MetadataLostError, NodeUnavailableError
from tectonic_emu.identity import check_metadata, set_aside_damaged
from tectonic_emu.localfile import atomic_output
from tectonic_emu.metadata.snapshot import SnapshotInfo, dump, load
from tectonic_emu.resources import human_bytes
from tectonic_emu.services.backup import (
    BackupInfo,
    list_backups,
    prune,
    restore,
    take_backup,
    unaccounted,
)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


@click.group("meta")
def meta_group() -> None:
    """Dump, load, back up and restore the cluster's metadata (its whole namespace).

    Backups go onto the cluster's own nodes, every `--backup-interval` of `cluster create`
    (1 h by default); `meta restore --latest` finds them without any metadata.

    \b
    Example:
      tectonic-emu meta backups --cluster /tmp/c1
      tectonic-emu meta restore --cluster /tmp/c1 --latest
      tectonic-emu meta dump --cluster /tmp/c1 /backups/c1-meta.dump
    """


async def _replaceable(cluster: Cluster, force: bool, what: str) -> str | None:
    """Why the metadata needs replacing (it is lost), or None when it is intact and
    ``force`` allows replacing it anyway; InvalidArgumentError when intact without it. A
    local ``serve`` must be stopped first: its clients would keep the old namespace."""
    if cluster.served and not cluster.config.node_addresses:
        raise NodeUnavailableError(
            f"the cluster is served: stop it first (`tectonic-emu serve --stop`), then {what}",
            str(cluster.path),
        )
    try:
        await check_metadata(cluster.path, cluster.config, cluster.meta.kv)
    except MetadataLostError as e:
        return e.message.split(":")[0]
    if not force:
        raise InvalidArgumentError(
            f"the metadata is intact; to {what} over it (losing every change since), add --force",
            str(cluster.path),
        )
    return None


@meta_group.command("dump")
@cluster_option
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace FILE even if it is a symlink or special file.")
@json_option
def dump_cmd(cluster_dir: Path, file: Path, force: bool, as_json: bool) -> None:
    """Write a consistent snapshot of the whole metadata to FILE (versioned, checksummed).

    FILE is written through a temporary file in its directory and renamed into place; a
    symlink or a non-regular file there is refused unless --force.

    \b
    Example:
      tectonic-emu meta dump --cluster /tmp/c1 c1-meta.dump
    """

    async def go() -> SnapshotInfo:
        async with Cluster.open(cluster_dir) as c:
            with atomic_output(file, force=force) as out:
                return await dump(c.meta.kv, out, created=time.time())

    info = run(go())
    if as_json:
        print_json({"file": str(file), **_snap(info)})
    else:
        click.echo(
            f"dumped {info.keys} keys ({human_bytes(info.nbytes)}, sha256 {info.sha256[:16]}) "
            f"to {file}"
        )


def _snap(info: SnapshotInfo) -> dict[str, Any]:
    return {"keys": info.keys, "bytes": info.nbytes, "sha256": info.sha256,
            "created": info.created, "cluster_id": info.cluster_id}  # fmt: skip


async def _open_for_replace(cluster_dir: Path) -> Path | None:
    config = ClusterConfig.load(cluster_dir)
    return await set_aside_damaged(cluster_dir, config)


@meta_group.command("load")
@cluster_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace metadata that is intact.")
@json_option
def load_cmd(cluster_dir: Path, file: Path, force: bool, as_json: bool) -> None:
    """Replace the cluster's metadata by the dump in FILE (from `meta dump`).

    The dump is checked whole first (format, checksum, that it is this cluster's). Metadata
    that is lost (missing, empty, damaged, another cluster's) is replaced; intact metadata
    only with --force. A damaged SQLite file is kept as metadata.db.damaged-TIME.

    \b
    Example:
      tectonic-emu meta load --cluster /tmp/c1 c1-meta.dump
    """

    async def go(src: BinaryIO) -> tuple[SnapshotInfo, Path | None]:
        aside = await _open_for_replace(cluster_dir)
        async with Cluster.open(cluster_dir, recover=True, exclusive=True) as c:
            await _replaceable(c, force, "load a dump")
            info = await load(c.meta.kv, src, replace=True, cluster_id=c.config.cluster_id)
            return info, aside

    with open(file, "rb") as src:
        info, aside = run(go(src))
    if as_json:
        print_json({"file": str(file), "set_aside": str(aside) if aside else None, **_snap(info)})
        return
    if aside:
        click.echo(f"the damaged metadata file is kept as {aside}")
    click.echo(f"loaded {info.keys} keys from {file} (dumped {_when(info.created)})")


@meta_group.command("backup")
@cluster_option
@json_option
def backup_cmd(cluster_dir: Path, as_json: bool) -> None:
    """Back the metadata up onto the cluster's nodes now, and retire the oldest backups
    beyond the cluster's kept count.

    \b
    Example:
      tectonic-emu meta backup --cluster /tmp/c1
    """

    async def go() -> tuple[BackupInfo, list[str]]:
        async with Cluster.open(cluster_dir) as c:
            info = await take_backup(c.nodes, c.meta.kv, part_size=c.config.block_size)
            return info, await prune(c.nodes, keep=c.config.backup_keep)

    info, removed = run(go())
    if as_json:
        print_json({**info.to_dict(), "retired": removed})
    else:
        click.echo(
            f"backup {info.id}: {info.keys} keys, {human_bytes(info.nbytes)} on "
            f"{info.copies} nodes; retired {len(removed)}"
        )


@meta_group.command("backups")
@cluster_option
@json_option
def backups_cmd(cluster_dir: Path, as_json: bool) -> None:
    """List the metadata backups on the cluster's live nodes, newest first (works without
    any metadata: the nodes are listed).

    \b
    Example:
      tectonic-emu meta backups --cluster /tmp/c1 --json
    """

    async def go() -> list[BackupInfo]:
        async with Cluster.open(cluster_dir, recover=True) as c:
            return await list_backups(c.nodes)

    found = run(go())
    if as_json:
        print_json([b.to_dict() for b in found])
        return
    if not found:
        click.echo("no metadata backups on the live nodes")
    for b in found:
        state = "complete" if b.complete else "INCOMPLETE"
        click.echo(
            f"{b.id}  {_when(b.created)}  {b.keys} keys  {human_bytes(b.nbytes)}  "
            f"{b.copies} copies  {state}"
        )


@meta_group.command("restore")
@cluster_option
@click.option("--latest", is_flag=True, help="The newest complete, checksum-valid backup.")
@click.option("--id", "backup_id", default=None, help="The backup with this id (`meta backups`).")
@click.option("--force", is_flag=True, help="Replace metadata that is intact.")
@json_option
def restore_cmd(
    cluster_dir: Path, latest: bool, backup_id: str | None, force: bool, as_json: bool
) -> None:
    """Replace lost metadata by a backup from the cluster's nodes.

    Writes made after the backup are lost: their chunks, which no restored block names, are
    counted (repair's garbage collection removes them). Metadata that is intact is replaced
    only with --force. A damaged SQLite file is kept as metadata.db.damaged-TIME.

    \b
    Example:
      tectonic-emu meta restore --cluster /tmp/c1 --latest
      tectonic-emu meta restore --cluster /tmp/c1 --id 20261201t231500123z-a1b2
    """
    if latest == (backup_id is not None):
        raise click.UsageError("give one of --latest and --id")

    async def go() -> dict[str, Any]:
        aside = await _open_for_replace(cluster_dir)
        async with Cluster.open(cluster_dir, recover=True, exclusive=True) as c:
            why = await _replaceable(c, force, "restore a backup")
            info, snap, skipped = await restore(
                c.nodes, c.meta.kv, cluster_id=c.config.cluster_id, backup_id=backup_id
            )
            lost = await unaccounted(c.nodes, c.meta, since=info.created)
        return {
            "backup": info.to_dict(),
            "keys": snap.keys,
            "replaced": why or "intact metadata (--force)",
            "set_aside": str(aside) if aside else None,
            "skipped": skipped,
            "lost_chunks": lost.chunks,
            "lost_bytes": lost.nbytes,
            "older_unreferenced_chunks": lost.older,
            "unreadable_blocks": lost.blocks_lost,
        }

    out = run(go())
    if as_json:
        print_json(out)
        return
    b = out["backup"]
    if out["set_aside"]:
        click.echo(f"the damaged metadata file is kept as {out['set_aside']}")
    for line in out["skipped"]:
        click.echo(f"skipped backup {line}")
    click.echo(f"restored backup {b['id']} of {_when(b['created'])}: {out['keys']} keys")
    click.echo(
        f"lost: writes after {_when(b['created'])}: {out['lost_chunks']} chunks "
        f"({human_bytes(out['lost_bytes'])}) on the nodes belong to no restored file "
        "(repair collects them)"
        + (
            f"; {out['older_unreferenced_chunks']} older unreferenced chunks (garbage, or "
            "blocks in flight when the backup was taken)"
            if out["older_unreferenced_chunks"]
            else ""
        )
        + (
            f"; {out['unreadable_blocks']} restored blocks lack the chunks to be read "
            "(files deleted after the backup)"
            if out["unreadable_blocks"]
            else ""
        )
    )


__all__ = ["meta_group"]
