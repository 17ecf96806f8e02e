"""Hosts on one machine: Linux network namespaces joined by a bridge, for the tests and benches
of a cluster that spans hosts (issue 8).

``Hosts(["n1", "n2", "client"])`` makes, for each name, a network namespace with its own
loopback and one interface ``eth0`` on a private /24 (``10.231.N.0/24``, N picked free),
plugged by a veth pair into a bridge in this (the root) namespace. The root namespace has the
bridge's address, ``gateway``, so a server here (PostgreSQL) reaches and is reached by every
host. ``popen(host, argv)`` runs a command inside a host (``ip netns exec``); ``cut(host)``
takes the host's link down, as if its cable were pulled (its processes run on, and nothing
reaches them), and ``mend(host)`` plugs it back. Leaving the ``with`` block ends every process
started through ``popen`` and removes the namespaces, the veth pairs and the bridge.

Needs root and iproute2 (``ip``); ``unavailable()`` says why not, else None. Every address
used is inside the namespaces this module made.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

SUBNET = "10.231"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install iproute2)"
    probe = f"te-probe-{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> int:
    used = _ip("-o", "addr").stdout
    free = [n for n in range(1, 255) if f" {SUBNET}.{n}." not in used]
    if not free:
        raise OSError(f"no free /24 in {SUBNET}.0.0/16")
    return random.choice(free)


class Hosts:
    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not 1 <= len(names) <= 200:
            raise ValueError(f"1 to 200 distinct host names, not {list(names)}")
        self.names = list(names)
        tag = f"te{os.getpid() % 100000}"  # interface names: 15 characters at most
        self._tag = tag
        self._net = _free_subnet()
        self.bridge = f"{tag}br"
        self.gateway = f"{SUBNET}.{self._net}.1"
        self.network = f"{SUBNET}.{self._net}.0/24"
        self.ns = {h: f"{tag}-{h}" for h in names}
        self.ip = {h: f"{SUBNET}.{self._net}.{10 + i}" for i, h in enumerate(names)}
        self._veth = {h: f"{tag}v{i}" for i, h in enumerate(names)}
        self._procs: list[subprocess.Popen[Any]] = []
        self._made: list[tuple[str, ...]] = []  # undo commands, last first

    def __enter__(self) -> Hosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", "del", self.bridge))
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, h in enumerate(self.names):
                ns, outside, inside = self.ns[h], self._veth[h], f"{self._tag}p{i}"
                _ip("netns", "add", ns)
                self._made.append(("netns", "del", ns))
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                self._made.append(("link", "del", outside))
                _ip("link", "set", outside, "master", self.bridge)
                _ip("link", "set", outside, "up")
                _ip("link", "set", inside, "netns", ns)
                _ip("-n", ns, "link", "set", inside, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.ip[h]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._undo()

    def _undo(self) -> None:
        while self._made:
            _ip(*self._made.pop(), check=False)

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``argv`` run inside ``host``, in a process group of its own (ended on exit)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[host], *argv], start_new_session=True, **kwargs
        )
        self._procs.append(proc)
        return proc

    def cut(self, host: str) -> None:
        """Take ``host`` off the network: its link goes down, its processes run on."""
        _ip("link", "set", self._veth[host], "down")

    def mend(self, host: str) -> None:
        """Put ``host`` back on the network."""
        _ip("link", "set", self._veth[host], "up")


def host_copy(template: Path, where: Path) -> Path:
    """A host's own cluster directory ``where``: nothing but its copies of the template's
    cluster.json and secret (the metadata is in PostgreSQL, each node's chunks on its host),
    and of a ``--tls`` cluster's CA and node certificate and key (docs/deploy.md, *TLS*)."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(template / "cluster.json", where / "cluster.json")
    shutil.copy(template / "secret", where / "secret")  # keeps its mode, 0600
    if (template / "tls").is_dir():
        (where / "tls").mkdir(mode=0o700, exist_ok=True)
        for name in ("ca.pem", "node.pem", "node.key"):
            shutil.copy(template / "tls" / name, where / "tls" / name)
    return where


def serve_nodes(net: Hosts, template: Path, where: Path, node_hosts: Sequence[str]) -> None:
    """Node k served by ``tectonic-emu node serve`` on host ``node_hosts[k]``, from that
    host's own cluster directory ``where/<host>``; their output in ``where/nodes.log``."""
    for h in set(node_hosts):
        host_copy(template, where / h)
    with open(where / "nodes.log", "ab") as log:
        for k, h in enumerate(node_hosts):
            cmd = [sys.executable, "-m", "tectonic_emu", "node", "serve"]
            net.popen(h, [*cmd, "--cluster", str(where / h), "--node", str(k)],
                      stdin=subprocess.DEVNULL, stdout=log, stderr=log)  # fmt: skip


def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


__all__ = ["Hosts", "host_copy", "listening", "serve_nodes", "unavailable"]
