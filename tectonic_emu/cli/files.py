"""The namespace commands: ``put``, ``get``, ``ls``, ``mkdir``, ``mv``, ``rm``, ``stat``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import click

from tectonic_emu.cli.common import (
    cluster_option,
    json_option,
    print_json,
    progress_bar,
    run,
    with_cluster,
)
from tectonic_emu.cli.listing import entry_name, long_listing, stat_dict, stat_lines
from tectonic_emu.cluster import Cluster
from tectonic_emu.errors import IsADirectoryError_, NotFoundError
from tectonic_emu.localfile import atomic_output
from tectonic_emu.paths import join_path, split_path


# -- files -----------------------------------------------------------------------------------
@click.command("put")
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


@click.command("get")
@cluster_option
@click.argument("remote")
@click.argument("local", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option(
    "--force",
    is_flag=True,
    help="Replace LOCAL even when it is a symlink, device, FIFO or socket: the entry itself "
    "becomes a regular file (a link's target, a device, is never written).",
)
def get(cluster_dir: Path, remote: str, local: str, force: bool) -> None:
    """Copy REMOTE out of the cluster to a local file (or - for stdout).

    The bytes go to a new private temporary file beside LOCAL, which replaces LOCAL only once
    the copy is complete and fsync'd. A LOCAL that is a symlink or not a regular file is
    refused (never followed), unless --force.

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
        # One reader for the whole copy: it looks the block list up once, where read_into
        # per piece would scan every block entry of the file for each piece.
        reader = await client.reader(remote)
        piece = c.config.block_size * 4
        buf = bytearray(min(piece, max(reader.size, 1)))
        with contextlib.ExitStack() as stack:
            dst: BinaryIO = (
                sys.stdout.buffer
                if local == "-"
                else stack.enter_context(atomic_output(Path(local), force=force))
            )
            with progress_bar(reader.size) as bar:
                task = bar.add_task(f"get {remote}", total=reader.size)
                off = 0
                while off < reader.size:
                    n = await reader.read_into(off, buf)
                    if n == 0:
                        break
                    await asyncio.to_thread(dst.write, memoryview(buf)[:n])
                    off += n
                    bar.advance(task, n)
            dst.flush()

    run(with_cluster(cluster_dir, go))


@click.command("ls")
@cluster_option
@click.argument("path", default="/")
@click.option(
    "-l",
    "long",
    is_flag=True,
    help="Long listing, as ls -l: type and permissions, links, uid, gid (numbers), size, "
    "encoding, state (s sealed, o open, - not a regular file), mtime (local), name, and "
    "-> target for a symlink.",
)
@json_option
def ls(cluster_dir: Path, path: str, long: bool, as_json: bool) -> None:
    """List a directory (a path that is not one lists as itself; a symlink is never
    followed).

    \b
    Example:
      tectonic-emu ls --cluster /tmp/c1 -l /ckpt
      lrwxrwxrwx 1    0    0        7 -      - 2026-12-08 10:42 latest -> step-10
      -rw-r--r-- 2 1000 1000 67108864 rs-6-3 s 2026-12-08 10:41 model.bin
      drwxr-xr-x 2    0    0        0 r3     - 2026-12-08 10:41 step-10/
    """

    async def go(c: Cluster) -> list[dict[str, Any]]:
        client = c.client()
        st = await client.stat(path)
        if st.kind != "dir":
            return [stat_dict(st)]
        out = []
        for e in await client.scandir(path):
            sub = await client.stat(path.rstrip("/") + "/" + e.name)
            out.append(stat_dict(sub))
        return out

    rows = run(with_cluster(cluster_dir, go))
    if as_json:
        print_json(rows)
        return
    for line in long_listing(rows) if long else [entry_name(r) for r in rows]:
        click.echo(line)


@click.command("mkdir")
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


@click.command("mv")
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


@click.command("rm")
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


@click.command("stat")
@cluster_option
@click.argument("path")
@json_option
def stat(cluster_dir: Path, path: str, as_json: bool) -> None:
    """Size, encoding, sealed, mode, owners, links and times, and (regular files) every
    block's chunks with node, disk and file path.

    \b
    Example:
      tectonic-emu stat --cluster /tmp/c1 /ckpt/step-10/rank-0 --json
    """

    async def go(c: Cluster) -> dict[str, Any]:
        client = c.client()
        st = await client.stat(path)
        d = stat_dict(st)
        if st.kind == "file":  # a symlink, a fifo... has no blocks
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
    for line in stat_lines(d):
        click.echo(line)
    for b in d.get("block_list", []):
        nodes = ",".join(f"n{c['node']}/d{c['disk']}" for c in b["chunks"])
        click.echo(f"  block {b['block_no']} @{b['offset']} +{b['length']}: {nodes}")


__all__ = ["get", "ls", "mkdir", "mv", "put", "rm", "stat"]
