"""``tenant``: tenants, their namespaces and quotas (``tectonic_emu/tenancy.py``)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from tectonic_emu.cli.common import cluster_option, json_option, out_console, print_json, run
from tectonic_emu.cluster import Cluster
from tectonic_emu.config import parse_size
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.resources import human_bytes
from tectonic_emu.tenancy import Keep, Tenant


@click.group("tenant")
def tenant_group() -> None:
    """Tenants: namespaces with quotas on files and bytes.

    A tenant owns one or more namespaces, directories made for it. Everything below one is
    charged to it; a create or a write past a quota fails with EDQUOT, and a rename or hard
    link across namespaces with EXDEV (so `mv` copies).

    \b
    Example:
      export TECTONIC_EMU_CLUSTER=/tmp/c1
      tectonic-emu tenant create llama /ckpt/llama /llama-data --bytes 2TiB
      tectonic-emu tenant ls
      tectonic-emu tenant quota llama --files 1000000
    """


def _quota(text: str | None, what: str) -> int | Keep | None:
    """A --files or --bytes value: "keep" when not given, None for "none", else a count."""
    if text is None:
        return "keep"
    if text.lower() in ("none", "unlimited"):
        return None
    if what == "bytes":
        return parse_size(text)
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise InvalidArgumentError(f"--files takes a count or 'none', not {text!r}") from None
    if value < 0:
        raise InvalidArgumentError(f"--files takes a count of at least 0, not {text!r}")
    return value


_FILES_HELP = "Quota of files and directories (a count, or 'none')."
_BYTES_HELP = "Quota of stored bytes (e.g. 500GiB, or 'none')."


@tenant_group.command("create")
@cluster_option
@click.argument("name")
@click.argument("namespaces", nargs=-1, required=True)
@click.option("--files", "files", default=None, help=_FILES_HELP + " [default: none]")
@click.option("--bytes", "nbytes", default=None, help=_BYTES_HELP + " [default: none]")
@json_option
def create_cmd(
    cluster_dir: Path,
    name: str,
    namespaces: tuple[str, ...],
    files: str | None,
    nbytes: str | None,
    as_json: bool,
) -> None:
    """Make tenant NAME with a new, empty directory at each of NAMESPACES.

    Each namespace's parent must exist, outside every tenant's namespace.

    \b
    Example:
      tectonic-emu tenant create --cluster /tmp/c1 llama /ckpt/llama --bytes 1TiB
    """
    qf, qb = _quota(files, "files"), _quota(nbytes, "bytes")

    async def go() -> Tenant:
        async with Cluster.open(cluster_dir) as c:
            return await c.client().tenants.create(
                name,
                list(namespaces),
                quota_files=None if isinstance(qf, str) else qf,
                quota_bytes=None if isinstance(qb, str) else qb,
            )

    _show([run(go())], as_json)


@tenant_group.command("ls")
@cluster_option
@json_option
def ls_cmd(cluster_dir: Path, as_json: bool) -> None:
    """List the tenants: namespaces, quotas and what each uses.

    \b
    Example:
      tectonic-emu tenant ls --cluster /tmp/c1 --json
    """

    async def go() -> list[Tenant]:
        async with Cluster.open(cluster_dir) as c:
            return await c.client().tenants.list()

    _show(run(go()), as_json)


@tenant_group.command("quota")
@cluster_option
@click.argument("name")
@click.option("--files", "files", default=None, help=_FILES_HELP + " [default: as it is]")
@click.option("--bytes", "nbytes", default=None, help=_BYTES_HELP + " [default: as it is]")
@json_option
def quota_cmd(
    cluster_dir: Path, name: str, files: str | None, nbytes: str | None, as_json: bool
) -> None:
    """Change tenant NAME's quotas (or show them, given neither).

    A quota below what the tenant uses is allowed: it can then only shrink.

    \b
    Example:
      tectonic-emu tenant quota --cluster /tmp/c1 llama --bytes 2TiB --files none
    """
    qf, qb = _quota(files, "files"), _quota(nbytes, "bytes")

    async def go() -> Tenant:
        async with Cluster.open(cluster_dir) as c:
            tenants = c.client().tenants
            if qf == "keep" and qb == "keep":
                return await tenants.get(name)
            return await tenants.set_quota(name, files=qf, nbytes=qb)

    _show([run(go())], as_json)


@tenant_group.command("rm")
@cluster_option
@click.argument("name")
def rm_cmd(cluster_dir: Path, name: str) -> None:
    """Remove tenant NAME and its namespaces' directories, which must be empty.

    \b
    Example:
      tectonic-emu tenant rm --cluster /tmp/c1 llama
    """

    async def go() -> None:
        async with Cluster.open(cluster_dir) as c:
            await c.client().tenants.remove(name)

    run(go())


def _limit(used: int, quota: int | None, size: bool) -> str:
    text = human_bytes if size else "{:,}".format
    return f"{text(used)} of {'-' if quota is None else text(quota)}"


def _show(tenants: list[Tenant], as_json: bool) -> None:
    if as_json:
        print_json([t.to_dict() for t in tenants])
        return
    if not tenants:
        click.echo("no tenants")
        return
    table = Table(title="tenants (used of quota; - : no limit)")
    for col in ("tenant", "namespaces", "files", "bytes"):
        table.add_column(col)
    for t in tenants:
        table.add_row(
            t.name,
            "\n".join(t.namespaces),
            _limit(t.files_used, t.quota_files, False),
            _limit(t.bytes_used, t.quota_bytes, True),
        )
    out_console.print(table, width=80)


__all__ = ["tenant_group"]
