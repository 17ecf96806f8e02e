"""TLS for the links between clients and nodes (``cluster create --tls``, docs/deploy.md).

A cluster with a directory ``DIR/tls`` speaks TLS on every node connection: nodes present
``node.pem`` (key ``node.key``), clients check it against ``ca.pem`` and the host they
connect to. ``make_certificates`` makes them with the ``openssl`` binary: a self-signed CA
and one node certificate naming every node host, loopback and this host. A user's own
certificates go to the same three paths (the node certificate must name the hosts clients
connect to). TLS adds encryption; authentication stays the cluster secret's (``auth.py``).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterable
from pathlib import Path

from tectonic_emu.errors import InvalidArgumentError

TLS_DIR = "tls"


def tls_dir(root: Path) -> Path:
    return Path(root) / TLS_DIR


def make_certificates(root: Path, hosts: Iterable[str]) -> Path:
    """Make ``DIR/tls`` (mode 0700) with a new CA and a node certificate for ``hosts`` plus
    loopback and this host's name. Raises InvalidArgumentError when ``openssl`` is missing or
    fails (its message in the line)."""
    if shutil.which("openssl") is None:
        raise InvalidArgumentError("--tls needs the openssl command (apt-get install openssl)")
    where = tls_dir(root)
    where.mkdir(mode=0o700, exist_ok=True)
    names = {"localhost", socket.gethostname(), "127.0.0.1", "::1", *hosts}
    san = ",".join(
        f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in sorted(names) if n and n != "0.0.0.0"
    )
    days = "3650"

    def run(*args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=where)
        if done.returncode != 0:
            raise InvalidArgumentError(f"openssl {args[0]} failed: {done.stderr.strip()}")

    old = os.umask(0o077)  # keys readable by the owner alone
    try:
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", days,
            "-subj", "/CN=tectonic-emu cluster CA", "-keyout", "ca.key", "-out", "ca.pem",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=tectonic-emu node",
            "-keyout", "node.key", "-out", "node.csr")  # fmt: skip
        (where / "node.ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        )
        run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", days, "-out", "node.pem",
            "-extfile", "node.ext")  # fmt: skip
    finally:
        os.umask(old)
    for leftover in ("node.csr", "node.ext", "ca.srl"):
        (where / leftover).unlink(missing_ok=True)
    return where


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def server_context(root: Path) -> ssl.SSLContext | None:
    """The nodes' TLS context, or None for a cluster without ``DIR/tls``."""
    where = tls_dir(root)
    if not (where / "node.pem").exists():
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(where / "node.pem", where / "node.key")
    return ctx


def client_context(root: Path) -> ssl.SSLContext | None:
    """The clients' TLS context (the node certificate checked against ``ca.pem`` and the host
    connected to), or None for a cluster without ``DIR/tls``."""
    where = tls_dir(root)
    if not (where / "ca.pem").exists():
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(where / "ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


__all__ = ["TLS_DIR", "client_context", "make_certificates", "server_context", "tls_dir"]
