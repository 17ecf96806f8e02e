"""``tectonic-emu mount`` and ``tectonic-emu umount`` (registered through the
``tectonic_emu.commands`` entry point, as the mount sits above the core)."""

from __future__ import annotations

from pathlib import Path

import click

from tectonic_emu.cli import cluster_option


@click.command("mount")
@cluster_option
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--foreground", is_flag=True, help="Serve in this process until unmounted.")
@click.option("--encoding", default=None, help="Encoding of new files (default: inherited).")
@click.option(
    "--direct-io",
    is_flag=True,
    help="Bypass the kernel page cache (faster streaming; MAP_SHARED mmap fails: ENODEV).",
)
@click.option(
    "--no-allow-other",
    "private",
    is_flag=True,
    help="Keep a root mount to root (default: shared, modes checked by the kernel).",
)
@click.option("--log", type=click.Path(dir_okay=False, path_type=Path), help="Log file.")
@click.option("--debug", is_flag=True, help="libfuse debug output (foreground only).")
@click.option("--status-fd", type=int, hidden=True, help="(start_mount's child) Report here.")
def mount(
    cluster_dir: Path,
    mountpoint: Path,
    foreground: bool,
    encoding: str | None,
    direct_io: bool,
    private: bool,
    log: Path | None,
    debug: bool,
    status_fd: int | None,
) -> None:
    """Mount the cluster as a file system (embedded or served, whichever it is).

    Without --foreground the mount runs in the background and this returns once it is live.
    Unmount with `tectonic-emu umount MOUNTPOINT`. A mount point that has a mount already,
    live or dead (its process killed), is refused: umount it first.

    --direct-io skips the kernel page cache: large sequential reads and writes run faster,
    small ones each cost a round trip, and MAP_SHARED mmap is refused (docs/fuse.md).

    Mounted by root, every local user may use the mount as the stored modes, owners and
    groups allow (FUSE's allow_other and default_permissions); --no-allow-other keeps it
    to root. Another user's mount is theirs alone.

    \b
    Example:
      tectonic-emu mount --cluster /tmp/c1 /mnt/tectonic
      cp model.bin /mnt/tectonic/ckpt/ && sha256sum /mnt/tectonic/ckpt/model.bin
      tectonic-emu umount /mnt/tectonic
      tectonic-emu mount --cluster /tmp/c1 --direct-io /mnt/tectonic
    """
    from fuse_mount.mount import mount as run_mount
    from fuse_mount.mount import mount_for_parent, start_mount

    where = (cluster_dir, mountpoint)
    shared = not private
    if foreground and status_fd is not None:
        mount_for_parent(
            status_fd, *where, encoding=encoding, direct_io=direct_io, allow_other=shared,
            debug=debug,
        )  # fmt: skip
        return
    if foreground:
        run_mount(*where, encoding=encoding, direct_io=direct_io, allow_other=shared, debug=debug)
        return
    proc = start_mount(*where, encoding=encoding, direct_io=direct_io, allow_other=shared, log=log)
    click.echo(f"mounted {cluster_dir} at {mountpoint} (pid {proc.pid})")


@click.command("umount")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lazy", is_flag=True, help="Detach now even if busy or dead.")
def umount(mountpoint: Path, lazy: bool) -> None:
    """Unmount a tectonic-emu mount (also one whose process was killed).

    Refuses a path where no tectonic-emu mount is, and a busy mount (files open on it):
    close them, or detach it now with --lazy.

    \b
    Example:
      tectonic-emu umount /mnt/tectonic
    """
    from fuse_mount.mount import unmount

    unmount(mountpoint, lazy=lazy)
