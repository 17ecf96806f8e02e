"""A throwaway PostgreSQL server on loopback, for ``bench metadata`` and the tests.

``PostgresServer(bin_dir()).start()`` runs the server's own ``initdb`` and ``pg_ctl``
(Debian's ``postgresql`` package, which ``scripts/bootstrap.sh`` installs) in a fresh
temporary directory, listening on 127.0.0.1 at a free port with ``trust`` authentication for
the role ``tectonic``, and with PostgreSQL's defaults otherwise (``fsync`` on). PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user. Nothing is
shared with a system cluster, and ``stop()`` removes everything.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROLE = "tectonic"


def bin_dir() -> Path | None:
    """The newest PostgreSQL server's bin directory here, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One server: ``start()``, ``url``, ``pg_ctl("stop" | "start" | "restart")``, ``stop()``.
    Raises RuntimeError (with the tail of the server's log) when a step fails."""

    def __init__(
        self,
        bindir: Path,
        *,
        listen: Sequence[str] = ("127.0.0.1",),
        trust: Sequence[str] = (),
    ) -> None:
        """``listen``: the addresses to listen on (the first is in ``url``); ``trust``:
        networks (``10.231.5.0/24``) whose clients may connect as well as loopback's."""
        self.bindir = bindir
        self.listen = tuple(listen)
        self.trust = tuple(trust)
        self.dir = Path(tempfile.mkdtemp(prefix="tectonic-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as: Callable[[], None] | None = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

            def demote() -> None:
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)

            self._as = demote

    @property
    def url(self) -> str:
        return f"postgresql://{ROLE}@{self.listen[0]}:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        r = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            preexec_fn=self._as,  # the server must not run as root
            capture_output=True,
            text=True,
            cwd=self.dir,
        )
        if r.returncode != 0:
            log = self.dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {r.stderr.strip()}\n{tail}")

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "-E", "UTF8")
        if self.ssl:
            self._make_certificate()
        if self.trust:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.writelines(f"host all all {net} trust\n" for net in self.trust)
        self.pg_ctl("start")
        return self

    @property
    def ssl(self) -> bool:
        """TLS on when it listens beyond loopback: clients then default to sslmode=require
        (``metadata/_postgres.py``), as on a real network."""
        return any(not ipaddress.ip_address(a).is_loopback for a in self.listen)

    def _make_certificate(self) -> None:
        """A self-signed certificate for the server (``openssl``), readable by it alone."""
        key, cert = self.dir / "server.key", self.dir / "server.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=tectonic-emu test", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        key.chmod(0o600)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for path in (key, cert):
                os.chown(path, pw.pw_uid, pw.pw_gid)

    def pg_ctl(self, action: str) -> None:
        """``pg_ctl start|stop|restart`` (stop and restart: fast mode; both wait)."""
        args = ["pg_ctl", "-D", str(self.data), "-w"]
        if action != "start":
            args += ["-m", "fast"]
        opts = f"-p {self.port} -c listen_addresses={','.join(self.listen)} -k {self.dir}"
        opts += " -c max_connections=200"
        if self.ssl:
            opts += f" -c ssl=on -c ssl_cert_file={self.dir}/server.crt"
            opts += f" -c ssl_key_file={self.dir}/server.key"
        self._run(*args, "-o", opts, "-l", str(self.dir / "server.log"), action)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
