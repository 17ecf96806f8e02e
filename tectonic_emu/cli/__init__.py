"""The ``tectonic-emu`` command.

Every command takes ``--cluster DIR`` (default ``$TECTONIC_EMU_CLUSTER``). Errors print one
line on stderr and exit non-zero; nothing stored changes. Packages above the core (bench,
fuse_mount, clients) add command groups through the ``tectonic_emu.commands`` entry point.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

import click

from tectonic_emu.cli.clusters import cluster_group
from tectonic_emu.cli.common import (
    cluster_option,
    cluster_option_with,
    err_console,
    json_option,
    out_console,
    print_json,
    progress_bar,
    run,
    with_cluster,
)
from tectonic_emu.cli.demo import demo
from tectonic_emu.cli.files import get, ls, mkdir, mv, put, rm, stat
from tectonic_emu.cli.meta import meta_group
from tectonic_emu.cli.serving import node_group, serve_cmd
from tectonic_emu.cli.tenant import tenant_group
from tectonic_emu.cli.upkeep import repair_cmd, scrub_cmd
from tectonic_emu.config import parse_duration
from tectonic_emu.errors import TectonicError
from tectonic_emu.qos.groups import TrafficGroup, set_process_group


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
@click.option(
    "--group",
    envvar="TECTONIC_EMU_GROUP",
    default=None,
    metavar="NAME[:CLASS[:SHARE[:RATE]]]",
    help="The traffic group of this command's requests: CLASS gold, silver or bronze, SHARE "
    "within the class, RATE in bytes/s per client (docs/qos.md) [default: "
    "$TECTONIC_EMU_GROUP, else default:silver].",
)
def cli(group: str | None) -> None:
    """tectonic-emu: a Tectonic-style store for studying AI-training storage.

    \b
    Example:
      export TECTONIC_EMU_CLUSTER=/tmp/c1
      tectonic-emu cluster create --nodes 9 --encoding rs-6-3
      tectonic-emu put model.bin /ckpt/model.bin
      tectonic-emu --group backup:bronze:1:200e6 get /ckpt/model.bin copy.bin
      tectonic-emu cluster status --json
    """
    if group is not None:
        set_process_group(TrafficGroup.parse(group))
        os.environ["TECTONIC_EMU_GROUP"] = group  # what this command starts runs in it too


for _command in (cluster_group, put, get, ls, mkdir, mv, rm, stat, serve_cmd, node_group):
    cli.add_command(_command)
for _command in (scrub_cmd, repair_cmd, demo, meta_group, tenant_group):
    cli.add_command(_command)


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


__all__ = [
    "cli",
    "cluster_option",
    "cluster_option_with",
    "err_console",
    "json_option",
    "main",
    "out_console",
    "parse_duration",
    "print_json",
    "progress_bar",
    "run",
    "with_cluster",
]
