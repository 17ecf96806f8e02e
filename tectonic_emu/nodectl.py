"""Node control: how a process finds, checks and signals the processes of a served cluster.

Files in the cluster directory (the *topology*; clients on any host that sees the directory
find the nodes through them)::

    DIR/nodes/n000/STOPPED        present while node 0 is out of service (embedded or served)
    DIR/nodes/n000/address.json   {"node", "host", "port", "pid", "hostname", "started"},
                                  written by the node process once it listens, removed when
                                  it stops cleanly (a SIGKILLed node leaves it: clients then
                                  find nothing listening and count the node as down)
    DIR/serve.json                {"pid", "control": [host, port], "hostname", "started"},
                                  written by ``tectonic-emu serve`` while it supervises

A cluster is *served* while any of these files exist (``is_served``). ``cluster.py`` reads them
to open and control a cluster; ``served.py``, the node processes and their supervisor, writes
them. Neither imports the other for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tectonic_emu.chunkstore.auth import AuthError, connect_control, pack_message, recv_message
from tectonic_emu.errors import (
    AuthenticationError,
    InvalidArgumentError,
    NodeUnavailableError,
    TectonicError,
)
from tectonic_emu.secret import load_secret, secret_path

ADDRESS_FILE = "address.json"
SERVE_FILE = "serve.json"
STOP_MARKER = "STOPPED"


def node_dir(root: Path, n: int) -> Path:
    return root / "nodes" / f"n{n:03d}"


# -- the topology files ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeAddress:
    node: int
    host: str
    port: int
    pid: int
    hostname: str
    started: float


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_address(root: Path, n: int) -> NodeAddress | None:
    data = _read_json(node_dir(root, n) / ADDRESS_FILE)
    if data is None:
        return None
    try:
        return NodeAddress(**data)
    except TypeError:
        return None


def write_address(root: Path, addr: NodeAddress) -> None:
    """Publish where node ``addr.node`` listens (atomically: readers see all of it or none)."""
    _write_json(node_dir(root, addr.node) / ADDRESS_FILE, asdict(addr))


def read_serve_file(root: Path) -> dict[str, Any] | None:
    return _read_json(root / SERVE_FILE)


def write_serve_file(root: Path, info: dict[str, Any]) -> None:
    _write_json(root / SERVE_FILE, info)


def is_served(root: Path, nodes: int) -> bool:
    """Whether a supervisor or any node process serves this cluster.

    Files left by processes that died are ignored when those processes ran on this host and
    are gone: a SIGKILLed supervisor takes its nodes with it, and the cluster is embedded
    again. (A killed node under a live supervisor still counts as served, and down.)
    Processes on other hosts cannot be checked from here and count as alive."""
    serve = read_serve_file(root)
    if serve is not None and _recorded_alive(str(serve.get("hostname", "")), serve.get("pid")):
        return True
    for n in range(nodes):
        addr = read_address(root, n)
        if addr is not None and _recorded_alive(addr.hostname, addr.pid):
            return True
    return False


# -- processes ---------------------------------------------------------------------------------
def _recorded_alive(hostname: str, pid: object) -> bool:
    if not is_local(hostname):
        return True
    return isinstance(pid, int) and pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie its parent has not reaped yet (which
    ``pid_alive`` still counts as alive)."""
    if not pid_alive(pid):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone meanwhile, or no /proc to tell
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def is_local(hostname: str) -> bool:
    """Whether a process recorded with ``hostname`` runs on this host."""
    return hostname == socket.gethostname()


# -- signals and requests ----------------------------------------------------------------------
def signal_node(root: Path, n: int, sig: int, *, wait: float = 10.0) -> int:
    """Send ``sig`` to the process serving node ``n`` on this host; returns its pid.

    After SIGKILL, returns once the process has exited; after SIGTERM, once it has exited or
    given up its address (it then only finishes the requests it had). So a ``start`` that
    follows never finds the old process still answering. Waits at most ``wait`` seconds."""
    addr = read_address(root, n)
    if addr is None:
        raise NodeUnavailableError(f"node {n} is not served")
    if not is_local(addr.hostname):
        raise InvalidArgumentError(
            f"node {n} runs on {addr.hostname}; signal it from there", str(root)
        )
    if pid_exited(addr.pid):
        raise NodeUnavailableError(f"node {n} (pid {addr.pid}) is not running")
    try:
        os.kill(addr.pid, sig)
    except ProcessLookupError:
        raise NodeUnavailableError(f"node {n} (pid {addr.pid}) is not running") from None

    def stopped() -> bool:
        if pid_exited(addr.pid):
            return True
        if sig != signal.SIGTERM:
            return False
        current = read_address(root, n)
        return current is None or current.pid != addr.pid

    if sig in (signal.SIGKILL, signal.SIGTERM):
        deadline = time.monotonic() + wait
        while not stopped() and time.monotonic() < deadline:
            time.sleep(0.005)
    return addr.pid


def control(
    root: Path, request: dict[str, Any], *, wait: float = 30.0, secret: bytes | None = None
) -> dict[str, Any]:
    """Send one request to the supervisor's control socket and return its reply. Both sides
    first prove they know the cluster secret (``secret``, default read from ``root/secret``).

    Raises NodeUnavailableError when no supervisor answers, AuthenticationError when the
    secret file is unusable or the supervisor does not prove the secret, TectonicError with
    the supervisor's message when it refuses the request."""
    info = read_serve_file(root)
    if info is None:
        raise NodeUnavailableError(
            "no `tectonic-emu serve` runs for this cluster (start nodes with `node serve`)",
            str(root),
        )
    if secret is None:
        secret = load_secret(secret_path(root))
    host, port = info["control"]
    try:
        with socket.create_connection((host, port), timeout=wait) as sock:
            session = connect_control(sock, secret)
            sock.sendall(pack_message(json.dumps(request).encode(), session.send))
            raw = recv_message(sock, session.receive)
    except AuthError as e:
        raise AuthenticationError(f"the supervisor at {host}:{port}: {e}", str(root)) from None
    except OSError as e:
        raise NodeUnavailableError(f"cannot reach the supervisor at {host}:{port} ({e})") from None
    reply = json.loads(raw or b"{}")
    if not reply.get("ok"):
        raise TectonicError(str(reply.get("error", "the supervisor refused the request")))
    return dict(reply)


__all__ = [
    "ADDRESS_FILE",
    "SERVE_FILE",
    "STOP_MARKER",
    "NodeAddress",
    "control",
    "is_local",
    "is_served",
    "node_dir",
    "pid_alive",
    "pid_exited",
    "read_address",
    "read_serve_file",
    "signal_node",
    "write_address",
    "write_serve_file",
]
