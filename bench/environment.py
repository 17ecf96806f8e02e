"""What a benchmark ran on: the machine and the versions of what it measured, for the JSON
and the report (``bench all --report``)."""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import subprocess
from collections.abc import Sequence
from importlib import metadata


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _tool(cmd: Sequence[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else None


def versions(peers: Sequence[str] = ()) -> dict[str, str]:
    """Versions of Python, the libraries on the data path, fio and the named peers."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "tectonic-emu": _package("tectonic-emu"),
        "sqlite": sqlite3.sqlite_version,
        "numpy": _package("numpy"),
        "torch": _package("torch"),
        "mfusepy": _package("mfusepy"),
        "pyeclib": _package("pyeclib"),
        "fio": _tool(["fio", "--version"]),
    }
    if peers:
        from bench import peers as peer_mod

        for name in peers:
            if name in peer_mod.PEERS and not peer_mod.missing(name):
                found[name] = peer_mod.version(name)
    return {k: v for k, v in found.items() if v}


def machine() -> dict[str, str]:
    """The machine: cores, memory, kernel, CPU model and OS."""
    info = {
        "cpus": str(os.cpu_count() or 0),
        "kernel": platform.release(),
    }
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory"] = f"{kb / (1 << 20):.1f} GiB"
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
        if model:
            info["cpu"] = model
    except OSError:
        pass
    try:
        with open("/etc/os-release") as f:
            rel = dict(ln.rstrip().split("=", 1) for ln in f if "=" in ln)
        info["os"] = rel.get("PRETTY_NAME", "").strip('"')
    except OSError:
        pass
    return info


__all__ = ["machine", "versions"]
